"""Model architectures: ModelSpec, parameter counts, config.json loading, presets."""
