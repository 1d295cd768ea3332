"""Building: render the context, BuildKit's argv and metadata, the compile probe's stage, host engine set-up, and the pipeline (preflight -> probe -> build -> verify -> tags)."""
