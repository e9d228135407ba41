"""``deepspeed.module_inject.auto_ep_presets``: AutoEP's known MoE families."""
