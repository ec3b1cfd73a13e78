"""Everything the commands (train.py, test.py, detect.py, export.py) and models/ build on, one room per job:

    data/      datasets and loaders, label files, image decoding, augmentation, media sources, the built-in
               dataset, data/hyp YAML, the COCO JSON converter
    engine/    training machinery: precision (amp), optimizer and recipe, EMA, loss, checkpoints, AutoBatch,
               AutoAnchor, callbacks, distributed, RNG, train.py's options
    report/    metrics (mAP), plots, drawing, previews, TensorBoard, results.csv
    interop/   YOLOv5 checkpoints in, exported models (ONNX, TorchScript) run
    (here)     the plumbing every room uses: errors, files, options, device, limits, box math, inference helpers

Imports run one way: commands -> models/ -> rooms -> plumbing; plumbing imports no room.
"""
