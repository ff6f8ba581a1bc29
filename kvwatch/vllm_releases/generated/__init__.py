"""Tables generated from each vLLM release's own source (scripts/gen_*.py; never edited by hand),
each stored as the oldest release's data and every later release's changes against the one before.
Read through the modules of kvwatch/vllm_releases, which expand them per release."""
