"""Model families as tasks the trainer runs (one file per family)."""
from zoo.tasks.gpt import GPTTask

TASKS = {"gpt": GPTTask}
