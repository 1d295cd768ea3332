"""Kernel coverage audit: which CUDA kernels in a binary, wheel or image can run on a GPU target."""
