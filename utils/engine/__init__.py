"""Training machinery: precision, optimizer and recipe, EMA, loss, checkpoints, AutoBatch/AutoAnchor, RNG."""
