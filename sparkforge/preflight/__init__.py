"""Preflight: facts about upstream (source at a commit, model registry, declared requirements, patch applicability, CMake arch plan, base images) checked before any build starts."""
