"""The planner: which layout to train with, decided from the config before a GPU is spent.

    python -m zoo.plan model.size=gpt3-175b cluster=dgx-a100 cluster.nodes=128 trainer.global_batch_size=1536

Its modules (this package imports none of them: a family's planner description imports
zoo.plan.model_desc' types without the planner, which looks families up, coming with them):
    zoo.plan.describe  describe_model(model_cfg, vocab_size) -> ModelDesc: the model as the planner sees it
    zoo.plan.search    estimate(desc, layout, cluster, dtype=, plan=) -> Candidate: memory and step time of
                       one PlanLayout; enumerate_layouts(...) -> [Candidate], ranked; make_plan(PlanRunConfig)
    zoo.plan.fit       predict_fit(...) -> (fits, mem); fit_warning(cfg, layout, device_mem_bytes): the
                       start-of-training warning; device_memory_bytes(ranks_on_host)
    zoo.plan.dry_run   what `python -m zoo.train ... --dry-run` prints
    zoo.plan.model_desc  the planner's types (ModelDesc, Piece, ParamCount, Activations)
    zoo.plan.memory, zoo.plan.step_time, zoo.plan.layout, zoo.plan.settings, zoo.plan.report
"""
