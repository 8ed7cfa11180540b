"""What a run trains and how: precision, optimizer, overheads, fine-tuning methods."""
