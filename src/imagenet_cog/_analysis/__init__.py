"""The analysis wing: what is computed from the features, predictions and levels besides the
paper's linear probe."""
