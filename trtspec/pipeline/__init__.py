"""The build: the stage contract (stage) and the runner that orders, fingerprints, locks and resumes the stages
(runner). Stages import `stage` and the library, never `runner` or each other."""
