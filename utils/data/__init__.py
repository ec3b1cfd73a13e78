"""Data: dataset YAMLs, label files, image decoding, augmentation, loaders, media sources, the built-in set."""
