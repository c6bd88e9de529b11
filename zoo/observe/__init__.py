"""Watching a run: the monitor's readings and diagnoses (`monitor`), the console and
metrics.jsonl (`metrics`), model FLOPs and device peaks (`flops`), time in collectives
(`comm_timer`), wandb (`tracking`) and comparing finished runs (`compare`)."""
