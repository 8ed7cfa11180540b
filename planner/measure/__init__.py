"""Measurement: a real PyTorch step under memory trackers, accuracy, DeepSpeed's estimators."""
