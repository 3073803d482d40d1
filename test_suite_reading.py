"""Reading a suite stays linear in its size: the duplicate-key check compares each key a bounded
number of times (it compared every key with every other, so 20,000 keys took 19 s)."""

import regression


class Key(str):
    """A JSON key that counts how often it is compared."""

    compared = 0

    def __eq__(self, other):
        Key.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_the_duplicate_key_check_compares_each_key_a_bounded_number_of_times():
    Key.compared = 0
    pairs = [(Key(f"k{n}"), n) for n in range(2000)]
    assert regression._no_duplicate_keys(pairs) == {key: n for key, n in pairs}
    assert Key.compared < 4 * len(pairs), Key.compared

