"""Kernel coverage audit: which CUDA kernels in a binary, wheel or image can run on a GPU target."""

from __future__ import annotations

from sparkforge.audit.coverage import format_audit_table
from sparkforge.audit.scan import audit_files, audit_tar_stream, audit_target

__all__ = ["audit_files", "audit_tar_stream", "audit_target", "format_audit_table"]
