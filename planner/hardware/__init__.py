"""GPUs, cluster topologies (networkx) and the placement of parallel groups on them."""
