"""Small value types every layer shares (pure): vLLM versions, block-size rules, config.json's numbers.

They sit below kvwatch.vllm_releases and kvwatch.planner, so the release data can name them without
importing the planner that reads it (docs/architecture.md, the layers).
"""
