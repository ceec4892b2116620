"""The EAGLE-3 head: modelopt's model and every private touch of it (head), its training step (train_step), the
checkpoint engines read (checkpoint), convert, export, the ONNX draft step (onnx_export) and its README (readme).
Training itself, the target's states and the acceptance measure are family-neutral: trtspec.training."""

ARCHITECTURES = ("LlamaForCausalLMEagle3",)  # what an exported EAGLE-3 draft's config.json names
