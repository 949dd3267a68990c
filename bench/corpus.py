"""The benchmarks' corpus: 20000 lines of 12 words drawn (seed 1) from a 16-word vocabulary.
Usage: python3 bench/corpus.py PATH"""
import random
import sys

random.seed(1)
words = "the quick brown fox jumps over a lazy dog while seven wizards box in the yard".split()
with open(sys.argv[1], "w") as f:
    for _ in range(20000):
        f.write(" ".join(random.choice(words) for _ in range(12)) + ".\n")
