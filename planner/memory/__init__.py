"""Per-rank memory: model states, activations, loss, buffers, overhead, the peak moment."""
