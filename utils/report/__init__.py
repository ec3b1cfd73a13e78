"""Reporting: metrics (mAP, confusion matrix), plots, drawing, previews, TensorBoard, results files."""
