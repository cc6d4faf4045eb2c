# Lifts the recursion limit and recurses until the C stack gives out.
import sys

sys.setrecursionlimit(10**7)


def down(n):
    return down(n + 1) + 1


down(0)
