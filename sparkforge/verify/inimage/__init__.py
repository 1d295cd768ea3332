"""The in-image suite: scripts that run inside a built image with only the image's Python (standard library,
torch, vLLM; never sparkforge). Every image carries a copy in /opt/sparkforge/image-tests; `invoke verify`
mounts this folder read-only and runs run_checks.py. The checks, in order, are declared in checklist.py.
"""
