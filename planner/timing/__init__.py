"""Step time: FLOPs, kernels, collectives, the pipeline, the data-parallel part."""
