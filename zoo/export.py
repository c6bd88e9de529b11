"""Export a run or a checkpoint to a Hugging Face transformers directory (see zoo.checkpoint.export).

    python -m zoo.export RUN_DIR_OR_CHECKPOINT OUT_DIR
"""
from zoo.checkpoint.export import main

if __name__ == "__main__":
    main()
