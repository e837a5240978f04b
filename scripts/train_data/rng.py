"""rng.py - a seeded generator whose stream never changes.

Python's `random` has kept its streams stable in practice, but that is not a
promise across versions (sample/randrange have changed shape before); the
data must be byte-identical on any Python 3, so we use SplitMix64, which is
a few lines and fully specified.
"""

_MASK = (1 << 64) - 1


class Rng:
    def __init__(self, seed):
        self.state = seed & _MASK

    def next64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & _MASK
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
        return z ^ (z >> 31)

    def below(self, n):
        """Uniform in [0, n) (rejection sampling: no modulo bias)."""
        limit = (1 << 64) - ((1 << 64) % n)
        while True:
            x = self.next64()
            if x < limit:
                return x % n

    def int(self, lo, hi):
        """Uniform in [lo, hi], both ends included."""
        return lo + self.below(hi - lo + 1)

    def choice(self, seq):
        return seq[self.below(len(seq))]

    def shuffle(self, items):
        for i in range(len(items) - 1, 0, -1):
            j = self.below(i + 1)
            items[i], items[j] = items[j], items[i]
        return items

    def sample(self, seq, k):
        return self.shuffle(list(seq))[:k]
