"""Other formats: YOLOv5 checkpoints read safely, exported models (ONNX, TorchScript) behind one interface."""
