"""python -m zoo.evaluate RUN_DIR_OR_CHECKPOINT_OR_HF_DIR --tasks ...: zoo.evaluate.command."""
from zoo.evaluate.command import main

main()
