"""Benchmarks: load suites (vLLM's own client, the field's llama-benchy profile), repeats and their noise, the
identity of a result, the comparison of two results, the result store by image digest, and charts."""
