"""The sampler loops: configuration, the engine loop, health per source, discovery, clock and NVTX marks."""
