"""The field's recipe formats: the community runner's `recipe_version: "1"` and Spark Arena's `recipe_version: 2`.

Pure functions: a community recipe's serve command becomes vLLM's own argv, then a serve profile; a profile
becomes a recipe of either format. Reading files and URLs, preflight and digests live on higher floors.
"""
