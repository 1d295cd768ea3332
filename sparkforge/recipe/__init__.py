"""Recipes: the typed schema, the YAML loader (`extends`, strict validation) and the plan (values, labels, tags)."""
