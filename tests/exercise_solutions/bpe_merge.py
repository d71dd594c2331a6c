def most_frequent_pair(words, counts):
    stats = {}
    for word, n in zip(words, counts):
        for a, b in zip(word, word[1:]):
            stats[(a, b)] = stats.get((a, b), 0) + n
    if not stats:
        return None, 0
    best = min(stats, key=lambda p: (-stats[p], p[0], p[1]))
    return best, stats[best]


def merge_pair(word, pair, new_id):
    out = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and word[i] == pair[0] and word[i + 1] == pair[1]:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out
