"""spark-submit entry point: ``spark-submit streaming/main.py`` with CANDLEWIRE_* config."""

from streaming.job import main

if __name__ == "__main__":
    main()
