"""Compare runs side by side and plot them (see zoo.observe.compare).

    python -m zoo.compare RUN_DIR... [--plot FILE.png]
"""
from zoo.observe.compare import main

if __name__ == "__main__":
    main()
