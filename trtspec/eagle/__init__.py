"""The EAGLE-3 head: modelopt's model and every private touch of it (head), the frozen target's hidden states
(states), the train-time-test trainer (trainer), the acceptance measure (acceptance), the checkpoint engines read
(checkpoint) and the ONNX draft step (onnx_export)."""
