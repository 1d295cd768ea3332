"""The registry side: push/publish/promote, pull and what it requires, manifests, pushed-digest records, cosign, the CI matrix."""
