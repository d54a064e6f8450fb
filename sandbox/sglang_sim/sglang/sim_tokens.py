"""The simulator's tokenizer: a prompt's tokens are its words, each word's id a fixed hash of it
(crc32 of the lower-cased word, punctuation stripped, modulo VOCAB), so that text and token ids
(a chat request reaches SGLang's request dump as the templated prompt's input_ids; /generate
takes input_ids too) name the same prompt across restarts, and a prompt's family (sim_perf.py)
is found in either."""
import zlib

VOCAB = 32000
PUNCTUATION = ".,;:!?()[]{}\"'`"


def word_id(word):
    return zlib.crc32(word.strip(PUNCTUATION).lower().encode()) % VOCAB


def encode(text):
    """The token ids of `text`: one per word."""
    return [word_id(w) for w in text.split()]


def count(prompt):
    """How many tokens a prompt (text, or a list of ids) holds."""
    return len(prompt) if isinstance(prompt, list) else len(str(prompt).split())


def family(prompt, families):
    """The first word of `families` ({word: alpha}) that `prompt` (text or ids) holds, else None."""
    if not families:
        return None
    ids = set(prompt) if isinstance(prompt, list) else set(encode(str(prompt)))
    return next((w for w in families if word_id(w) in ids), None)
