"""Free drafts: proposals copied from text the target has already seen, with no draft model.

A copied run of tokens costs the target one block and no draft time, so wherever text repeats (code being edited,
an answer quoting its document, a conversation revising its last answer, a tool-call loop, many requests of one
shape) it is the cheapest proposal there is. Two sources feed it, both in the target's tokens:

- the request itself: its prompt (the whole conversation, for a chat) and the output so far;
- the draft pool: the prompts and outputs of earlier requests on the same engine, bounded in tokens, shared by all
  of its sessions (a server's slots), kept apart per scope (a server's API key), cleared by `DraftPool.forget`;
  its text is copied on matches of POOL_MATCH tokens or more (other requests share the chat template's headers).

`TokenIndex` holds tokens in one growing list with, for every pair of consecutive tokens, the positions where the
pair ends. A proposal takes the longest match of the sequence's end (the last pair, extended backwards) among the
most recent occurrences in both sources, and follows the most frequent continuation of the occurrences that match
that long: at each step the token most of them continue with (ties: the most recent's), as long as at least
MIN_SHARE of them agree. Its length follows the match's length and what the target accepted of earlier copies
(`SuffixDrafter.factor`); the request's first copy, which goes to the target in the call that prefills the prompt,
takes its whole length, since a few more tokens add little to a call that wide. With the probabilities of its steps
it also gives the expected number of its tokens the target keeps, which the caller weighs against a draft model's
round (see drafters.FreeFirst).

Where the target parts from a copy (an edit: a renamed word, a changed argument, an inserted call), the text it
copied usually goes on a few tokens later. The drafter keeps its place in the source (`Anchor`) and, while no long
match exists, looks for the sequence's last token just after that place: found, the copy resumes behind it (the
target inserted or dropped tokens); otherwise, for the first few tokens after the parting, it resumes as many source
tokens on as the target has written since (the target replaced them), so an edit costs a round or two, not the
rounds of matching two tokens again. Where that would go on in the middle of a word (the target's last token and
the source's next spell one word: "N" written where the source had "L", followed by "yon"; a digit before a digit),
the target's new word or number may go on, so the copy does not resume there while another copy matches the
sequence's end; where none does, it guesses that the target's token took the place of the rest of the source's word
and resumes after that word. Where the target's first token spells only the start of the source's token there ("("
where the source had "(users", a renamed word after a bracket), the target split that token: the copy waits for its
next token and counts the two as replacing one. An anchor whose copies the target keeps nothing of RESUME_TRIES
times is dropped, and only text seen to repeat for RESUME_FROM_MATCH tokens or more (the match it was copied on and
the tokens the target kept of the copy) gets one: in text that does not repeat, a copy on a short match is mostly
chance, and so is what follows its parting. A copy of text seen to repeat less does not move the anchor: an edit
often takes its new value from elsewhere (a number from the user's message), and the edited text goes on after it.
A resumed copy is as long as a copy on a match of the anchor's repetition would be.

Where the target put a word of its own in place of a word of the copied text and then went on with that text (a
resumed copy it kept), the edit was probably a rename ("users" to "people" all through the code). The drafter
remembers it (`Rename`) and replays it in its later copies of the request's text: each whole word that spells the
old name is spelled with the new one (the tokens around it re-tokenized), so a rename costs one parting, not one
per occurrence. A rename the target parts from inside its new spelling is forgotten.

What the target keeps of copies depends on how long their match was: two matching tokens are often chance, eight
rarely. The drafter keeps a record per class of match length (how often the target kept a copy's first token,
decayed) and scales a copy's expected tokens by it, so the caller stops taking the copies of a class that keeps
missing while it still takes the others.

A proposal depends only on the tokens the index holds, never on a verification's random draws, so it is lossless
under sampling as every deterministic proposal is (verify.py: a token without q is kept with probability p(x)).
"""
from __future__ import annotations

import threading
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Callable, Optional

from .drafters import Drafter, Proposal
from .retokenize import Retokenizer

SEPARATOR = -1           # between two documents of a pool: no match or continuation crosses it
MAX_MATCH = 32           # a match is measured up to this many tokens back
MAX_CANDIDATES = 32      # the most recent occurrences of the last pair looked at, per source
MIN_SHARE = 0.3          # a continuation step needs at least this share of the matching occurrences
FREE_TOKENS = 16         # the most tokens one free proposal holds
MIN_FREE_TOKENS = 2      # a shorter proposal is not worth a round's block
LONG_MATCH = 3           # a match at least this long is taken before resuming at the anchor
RESUME_WINDOW = 8        # source tokens after the anchor searched for the sequence's last token
RESUME_SPAN = 24         # tokens the sequence may grow past the parting before the anchor is dropped
RESUME_REPLACED = 4      # at most this many tokens after the parting are taken as replacing as many source tokens
RESUME_TRIES = 3         # resumed copies of one anchor the target may keep nothing of before it is dropped
RESUMED_MATCH = 1        # the match length a resumed copy counts as (one token, near its anchor)
# a copy resumes only in text seen to repeat for at least this many tokens (its match and what the target kept of
# its copy): text that long repeats (code being edited, a quote, a tool call), so a parting there is likely an edit;
# after less it more likely means the text no longer repeats, and a resumed copy would take a round for nothing
RESUME_FROM_MATCH = 8
# a copy from the draft pool needs a match at least this long: other requests share the chat template's turn headers,
# system prompts and instructions with this one, so a shorter match there (an answer's start after the turn header)
# mostly says nothing of this answer, while text an earlier answer really repeats soon matches this long
POOL_MATCH = 8
MATCH_CLASSES = (1, 2, 4, 7)  # copies are judged apart by their match's length: 1, 2, 3-4, 5-7, 8 or more
RECORD_DECAY = 0.9       # the weight of a class's earlier copies in its record, per copy
RESUME_SHARE = 0.7       # the chance counted per step of a resumed copy (one occurrence, matched on one token)
DRAFT_POOL_TOKENS = 65536  # the default bound of an engine's draft pool (tokens over all scopes)
RENAMES = 4              # the most renames a request's copies replay (the latest)
MIN_RENAMED = 3          # a rename's old word has at least this many bytes (shorter ones occur everywhere)
# copies remembered until the target verified them (concurrent mode builds the next round's copy before this one's
# verification): their places (`recent`) and the renames they replayed (`replays`)
PENDING_COPIES = 4


def _pair(a: int, b: int) -> int:
    return (a << 32) | b


class TokenIndex:
    """Tokens in one growing list, and for each pair of consecutive tokens the positions where it ends.

    `start`: positions before it are forgotten (a pool's evicted documents); they are skipped where read and
    dropped from the lists when the index compacts."""

    def __init__(self, tokens: Optional[list[int]] = None):
        self.tokens: list[int] = []
        self.ends: dict[int, list[int]] = {}
        self.start = 0
        if tokens:
            self.extend(tokens)

    def __len__(self) -> int:
        return len(self.tokens) - self.start

    def extend(self, tokens: list[int]) -> None:
        seq, ends = self.tokens, self.ends
        for token in tokens:
            seq.append(int(token))
            if len(seq) > 1 and seq[-2] >= 0 and token >= 0:
                ends.setdefault(_pair(seq[-2], token), []).append(len(seq) - 1)

    def truncate(self, length: int) -> None:
        """Forget every token from position `length` on (a guessed sequence that did not come true)."""
        seq = self.tokens
        for p in range(len(seq) - 1, max(length, 1) - 1, -1):
            if seq[p - 1] >= 0 and seq[p] >= 0:
                key = _pair(seq[p - 1], seq[p])
                positions = self.ends[key]
                positions.pop()
                if not positions:
                    del self.ends[key]
        del seq[length:]

    def occurrences(self, context: list[int], skip_end: bool) -> list[tuple[int, int]]:
        """(match length, position) of the most recent occurrences of the context's last pair that have a token
        after them, the match extended backwards up to MAX_MATCH tokens. skip_end: the index holds the context
        itself, whose own end is no occurrence."""
        if len(context) < 2:
            return []
        positions = self.ends.get(_pair(context[-2], context[-1]), [])
        seq, found = self.tokens, []
        for p in reversed(positions):
            if p < self.start + 1 or len(found) == MAX_CANDIDATES:
                break
            if p + 1 >= len(seq) or seq[p + 1] < 0 or (skip_end and p == len(seq) - 1):
                continue
            n = 2
            while n < MAX_MATCH and n < len(context) and p - n >= self.start and seq[p - n] == context[-1 - n]:
                n += 1
            found.append((n, p))
        return found


@dataclass
class Copy:
    """A free proposal: its tokens, the chance that the target keeps it up to each of them (from the occurrences'
    votes), the match's length and where it came from ("suffix": the request, "pool": earlier requests); `scale`
    weighs the chances by how often copies matched this long were right (SuffixDrafter's records)."""
    tokens: list[int]
    chances: list[float]
    match: int
    source: str
    origin: Optional[tuple[list[int], int, int]] = None  # as Proposal.origin
    scale: float = 1.0

    @property
    def expected(self) -> float:
        """The expected number of its tokens the target keeps (a copy cut shorter expects only its own steps)."""
        return self.scale * sum(self.chances[:len(self.tokens)])


def best_copy(sources: list[tuple[str, TokenIndex, bool]], context: list[int], limit: int,
              min_match: Optional[dict[str, int]] = None) -> Optional[Copy]:
    """The most frequent continuation of the longest match of the context's end in the sources
    ((name, index, holds the context itself)), at most `limit` tokens; None where nothing matches. min_match: the
    shortest match a source's occurrences count with, by name (any match where not named)."""
    least = min_match or {}
    found = [(n, name, index, own, p) for name, index, own in sources for n, p in index.occurrences(context, own)
             if n >= least.get(name, 0)]
    if not found or limit < 1:
        return None
    longest = max(n for n, *_ in found)
    live = [(index, own, p) for n, _, index, own, p in found if n == longest]  # request first, most recent first
    source = next(name for n, name, *_ in found if n == longest)
    tokens, chances, chance = [], [], 1.0
    for step in range(limit):
        votes = Counter()
        nexts = []
        for index, own, p in live:
            q = p + 1 + step
            # past the end of the request's own text, a copy reads on in what it has copied: text that repeats
            # with a short period (a list, a run of blank lines) is copied for as long as the limit allows
            token = (index.tokens[q] if q < len(index.tokens) else
                     tokens[q - len(index.tokens)] if own else SEPARATOR)
            nexts.append(token)
            if token >= 0:
                votes[token] += 1
        if not votes:
            break
        top = max(votes.values())
        token = next(t for t in nexts if votes.get(t) == top)  # ties: the most recent occurrence's
        share = top / len(live)
        if share < MIN_SHARE:
            break
        chance *= share
        chances.append(chance)
        tokens.append(token)
        live = [occurrence for occurrence, t in zip(live, nexts) if t == token]
    first_index, _, first_p = live[0]
    return Copy(tokens, chances, longest, source, (first_index.tokens, first_p, len(context))) if tokens else None


class DraftPool:
    """The prompts and outputs of earlier requests on one engine, for free drafts: at most `max_tokens` tokens over
    all scopes, the oldest documents forgotten first. Thread-safe: a server's slots share it."""

    def __init__(self, max_tokens: int = DRAFT_POOL_TOKENS):
        self.max_tokens = max_tokens
        self.scopes: dict[str, TokenIndex] = {}
        self.documents: "OrderedDict[int, tuple[str, int]]" = OrderedDict()  # id -> (scope, tokens), oldest first
        self.size = 0  # tokens held (separators included)
        self._next_id = 0
        self.lock = threading.Lock()

    def add(self, tokens: list[int], scope: str = "") -> None:
        """Remember a request's tokens (its prompt and output) in a scope; drop the oldest documents over the bound."""
        if not self.max_tokens or len(tokens) < 2:
            return
        tokens = list(tokens[-self.max_tokens + 1:])
        with self.lock:
            index = self.scopes.setdefault(scope, TokenIndex())
            index.extend([SEPARATOR, *tokens])
            self.documents[self._next_id] = (scope, len(tokens) + 1)
            self._next_id += 1
            self.size += len(tokens) + 1
            while self.size > self.max_tokens:
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        _, (scope, length) = self.documents.popitem(last=False)
        index = self.scopes[scope]
        index.start += length
        self.size -= length
        if not len(index):
            del self.scopes[scope]
        elif index.start > len(index):  # mostly forgotten: rebuild it from what is left
            self.scopes[scope] = TokenIndex(index.tokens[index.start:])

    def index(self, scope: str = "") -> Optional[TokenIndex]:
        return self.scopes.get(scope)

    def forget(self, scope: Optional[str] = None) -> None:
        """Forget every document (of one scope, or of all with None)."""
        with self.lock:
            for doc, (s, _) in list(self.documents.items()):
                if scope is None or s == scope:
                    self.size -= self.documents.pop(doc)[1]
            if scope is None:
                self.scopes.clear()
            else:
                self.scopes.pop(scope, None)

    def describe(self) -> dict:
        """The pool's bound and contents, for `info`, `/metrics` and Result.extra."""
        with self.lock:
            return {"max_tokens": self.max_tokens, "tokens": self.size, "documents": len(self.documents),
                    "scopes": len(self.scopes)}


@dataclass(frozen=True)
class Rename:
    """A word the target wrote in place of another where it edited copied text: `old` -> `new` (their bytes,
    letters, digits and underscores)."""
    old: bytes
    new: bytes


def _is_word_byte(b: int) -> bool:
    """A letter or digit: a byte that goes on a word (an underscore parts the pieces of a name, "load_users")."""
    return 48 <= b <= 57 or 65 <= b <= 90 or 97 <= b <= 122


def renamed_word(old: bytes, new: bytes) -> Optional[Rename]:
    """The rename an edit made, from the text it replaced (`old`) and the text written in its place (`new`): the
    one whole word where the two differ, without what they share before and after it; None where they differ in
    more than one word, in a short word, or where nothing was replaced (an insertion)."""
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    while head and _is_word_byte(old[head - 1]):  # back to the start of the word the difference begins in
        head -= 1
    while tail and _is_word_byte(old[len(old) - tail]):  # and on to the end of the word it ends in
        tail -= 1
    old_word, new_word = old[head:len(old) - tail], new[head:len(new) - tail]

    def is_name(word: bytes) -> bool:  # letters, digits and underscores, a letter among them
        return all(_is_word_byte(b) or b == 95 for b in word) and any(97 <= (b | 32) <= 122 for b in word)
    if not (is_name(old_word) and is_name(new_word)) or len(old_word) < MIN_RENAMED or old_word in new_word:
        return None  # (an old name inside the new one would be renamed again in the text already renamed)
    return Rename(old_word, new_word)


def whole_words(text: bytes, word: bytes, start: int, lead: bytes) -> list[int]:
    """Where `word` stands in `text` as a whole word (no letter or digit on either side), from `start` on; `lead`:
    the text before it. One that ends the text is left out: the word may go on after it."""
    found, at = [], text.find(word, start)
    while at >= 0:
        before = text[at - 1] if at else lead[-1]
        end = at + len(word)
        if not _is_word_byte(before) and end < len(text) and not _is_word_byte(text[end]):
            found.append(at)
        at = text.find(word, at + 1)
    return found


@dataclass
class Replay:
    """A copy that replayed renames, as it went to the target: per rename replayed, the span of its tokens that
    spell the new word; its source, and per token the source position after it (None inside a new spelling); the
    sequence's length before it; the repetition its length was measured by."""
    spans: list[tuple[int, int, Rename]]
    source: list[int]
    after: list[Optional[int]]
    length: int
    basis: int


@dataclass
class Anchor:
    """A copy's place in its source after the target verified it: `tokens[next]` is the first source token the
    target has not kept, and `length` the sequence's length once the target wrote its own token there (exact: or,
    where a chained model's tokens were kept too, at least that)."""
    tokens: list[int]
    next: int
    source: str
    length: int
    exact: bool
    tries: int = 0  # resumed copies of this anchor the target kept nothing of
    repeated: int = 0  # tokens the text here was seen to repeat: the match of its first copy and what the target
    # kept of that copy (resumed copies keep their anchor's)


class SuffixDrafter(Drafter):
    """Free drafts for one request, from its own tokens and an engine's draft pool (see the module's docstring):
    the `suffix` algorithm's drafter, and the free source of a draft model's rounds (sources.FreeFirst).

    The proposal's length: at most `factor` tokens per matched token (at least MIN_FREE_TOKENS, at most
    FREE_TOKENS; a resumed copy counts its anchor's repetition as its match); the factor doubles after a copy the
    target kept whole and halves after one it kept less than half of, so text that keeps repeating is copied in
    long runs and text that does not in short ones. The first copy (the sequence is the prompt) takes its whole
    length: it rides in the prompt's prefill call.

    same_word(left, right): whether `right` after `left` goes on the same word (TokenBytes.same_word; None: never),
    so that a resumed copy does not start inside the target's new word; starts_with(whole, part): whether `whole`'s
    text begins with `part`'s and goes on (TokenBytes.starts_with; None: never), so that a target that split a
    source token ("(" then "people" where the source had "(users") is not taken as having replaced two. respell:
    the target's re-tokenizer, with which copies replay the renames the target made (see the module's docstring)."""

    free_tokens = FREE_TOKENS

    def __init__(self, prompt_ids: list[int], pool: Optional[DraftPool] = None, scope: str = "",
                 ends: tuple[int, ...] = (), same_word: Optional[Callable[[int, int], bool]] = None,
                 starts_with: Optional[Callable[[int, int], bool]] = None, respell: Optional[Retokenizer] = None):
        self.own = TokenIndex(prompt_ids)
        self.prompt_length = len(prompt_ids)
        self.pool, self.scope = pool, scope
        self.ends = frozenset(ends)  # end-of-sequence tokens: a copy stops after one (the run would stop there)
        self.same_word = same_word or (lambda left, right: False)
        self.starts_with = starts_with or (lambda whole, part: False)
        self.factor = 2.0
        self.anchor: Optional[Anchor] = None
        self.resumed = 0  # copies resumed at an anchor that went to the target
        self.recent: "OrderedDict[tuple, int]" = OrderedDict()  # a copy's place -> its match's length
        # per class of match length: decayed [copies whose first token the target kept, copies], from 1 of 1
        self.records = {c: [1.0, 1.0] for c in range(len(MATCH_CLASSES) + 1)}
        self.respell = respell  # spells a rename's text in the target's tokens (None: renames are not replayed)
        self.renames: list[Rename] = []  # the latest first
        # the last few copies that replayed a rename, by their tokens (concurrent mode builds the next round's copy
        # before the target verified this one's)
        self.replays: "OrderedDict[tuple[int, ...], Replay]" = OrderedDict()
        self.renamed = 0  # copies that replayed a rename and went to the target

    def sync(self, sequence: list[int]) -> None:
        """Make the request's index hold exactly `sequence` (it grows by a round's tokens; a guessed sequence
        that did not come true is cut back)."""
        own = self.own.tokens
        n = min(len(own), len(sequence))
        if own[:n] != sequence[:n]:  # rare: find where they part
            n = next(i for i, (a, b) in enumerate(zip(own, sequence)) if a != b)
        if n < len(own):
            self.own.truncate(n)
        self.own.extend(sequence[n:])

    def copy(self, sequence: list[int], limit: int = FREE_TOKENS) -> Optional[Copy]:
        """The best copy for the sequence's end, at most `limit` tokens (None: nothing worth a round)."""
        self.sync(sequence)
        sources = [("suffix", self.own, True)]
        pool = self.pool
        if pool is None:
            found = best_copy(sources, sequence, FREE_TOKENS)
        else:
            with pool.lock:
                pooled = pool.index(self.scope)
                found = best_copy(sources + ([("pool", pooled, False)] if pooled else []), sequence, FREE_TOKENS,
                                  {"pool": POOL_MATCH})
        if found is None or found.match < LONG_MATCH:
            found = self.resume(sequence, guess=found is None) or found
        if found is None:
            return None
        first = len(sequence) <= self.prompt_length  # (goes to the target with the prompt's prefill)
        # a resumed copy goes on in text seen to repeat for its anchor's `repeated` tokens: as long as a match that long
        basis = self.anchor.repeated if found.match == RESUMED_MATCH and self.anchor is not None else found.match
        length = limit if first else min(limit, max(MIN_FREE_TOKENS, int(self.factor * basis)))
        end = next((i + 1 for i, token in enumerate(found.tokens) if token in self.ends), len(found.tokens))
        found.tokens = found.tokens[:min(length, end)]
        kept, tried = self.records[match_class(found.match)]
        found.scale = kept / tried  # how often copies matched this long were right, in this request
        if self.renames and self.respell is not None and found.source == "suffix":  # (the pool: other requests')
            self.replay_renames(found, sequence[-1], length, basis)
        if len(found.tokens) < MIN_FREE_TOKENS and not (found.tokens and found.tokens[-1] in self.ends):
            return None  # (a copy that ends the answer is worth its round however short)
        if found.origin is not None:  # what verified() needs to know of it (the last few: concurrent mode)
            tokens, before, at_length = found.origin
            self.recent[(id(tokens), before, at_length)] = found.match
            while len(self.recent) > PENDING_COPIES:
                self.recent.popitem(last=False)
        return found

    def replay_renames(self, found: Copy, before: int, limit: int, basis: int) -> None:
        """Spell every whole word of the copy that a rename replaced with its new word (at most `limit` tokens in
        all): the tokens that hold the word are re-tokenized with the bytes around it. `before`: the token the copy
        follows; `basis`: the repetition its length was measured by (for the place to resume, see verified)."""
        pieces = self.respell.pieces
        source, at_source, length = found.origin
        tokens, chances, spans, start = list(found.tokens), list(found.chances), [], 0
        # per token of the copy: the source position after it (None inside a new spelling), where a copy kept up to
        # that token goes on
        after = [at_source + 2 + i for i in range(len(tokens))]
        lead = (pieces.piece(before) if before >= 0 else None) or b" "  # (a special token parts words too)
        while True:
            data = [pieces.piece(t) or b"" for t in tokens]
            text = b"".join(data)
            hit = min(((at, rename) for rename in self.renames for at in whole_words(text, rename.old, start, lead)),
                      default=None)
            if hit is None:
                break
            at, rename = hit
            ends = [0]
            for piece in data:
                ends.append(ends[-1] + len(piece))
            first = next(i for i in range(len(tokens)) if ends[i + 1] > at)  # the tokens that hold the word
            last = next(i for i in range(first, len(tokens)) if ends[i + 1] >= at + len(rename.old))
            spelled = text[ends[first]:at] + rename.new + text[at + len(rename.old):ends[last + 1]]
            new = self.respell.continuation([before] + tokens[:first], spelled)
            complete = len(self.respell.bytes_of(new)) == len(spelled)
            tokens = tokens[:first] + new + tokens[last + 1:]
            chances = chances[:first] + [chances[last]] * len(new) + chances[last + 1:]
            after = after[:first] + [None] * (len(new) - 1) + [after[last] if complete else None] + after[last + 1:]
            spans.append((first, first + len(new), rename))
            if not complete:  # (spelled only in part: the copy ends there)
                tokens, chances, after = tokens[:first + len(new)], chances[:first + len(new)], after[:first + len(new)]
                break
            start = ends[first] + len(spelled)  # the next word is looked for after the new spelling
        if spans:
            found.tokens, found.chances, found.origin = tokens[:limit], chances[:limit], None
            self.replays[tuple(found.tokens)] = Replay([span for span in spans if span[0] < limit], source,
                                                       after[:limit], length, basis)
            while len(self.replays) > PENDING_COPIES:
                self.replays.popitem(last=False)

    def resume(self, sequence: list[int], guess: bool = False) -> Optional[Copy]:
        """A copy that resumes at the anchor (see the module's docstring): behind the sequence's last token where
        it follows the anchor closely, or, for the first RESUME_REPLACED tokens after the parting, as many source
        tokens on as the target has written since. None: neither. guess (nothing else matches the sequence's
        end): where the latter would go on inside a source word, take the target's last token as having replaced
        the rest of that word and go on after it."""
        anchor = self.anchor
        if anchor is None:
            return None
        if len(sequence) > anchor.length + RESUME_SPAN:
            self.anchor = None
            return None
        tokens, last = anchor.tokens, sequence[-1]
        # nothing resumes past the end of the source's text (an end-of-sequence token: what follows is another turn)
        stop = next((q for q in range(anchor.next, min(len(tokens), anchor.next + RESUME_WINDOW + RESUME_SPAN))
                     if tokens[q] in self.ends), len(tokens))
        at = next((q for q in range(anchor.next, min(anchor.next + RESUME_WINDOW, stop)) if tokens[q] == last), None)
        written = len(sequence) - anchor.length + 1  # tokens the target wrote since it parted from the source
        if at is None and anchor.exact and 1 <= written <= RESUME_REPLACED:
            # the target's first token may spell the start of the source's token there ("(" of "(users"): it split
            # that token, and its next token spells the rest of it or replaces that rest ("people")
            split = anchor.next < len(tokens) and self.starts_with(tokens[anchor.next], sequence[anchor.length - 1])
            if split and written == 1:
                return None  # (inside the source's token: where the target's text goes on is not known yet)
            at = anchor.next + written - 1 - split  # they replaced as many source tokens: go on after those
            if at + 1 < len(tokens) and self.same_word(last, tokens[at + 1]):
                # inside a word: the target's word may go on ("N" of "Nice" where the source had "L" of "Lyon") or
                # have replaced the source's whole word ("Nice" for "L" + "yon")
                if not guess:
                    return None
                while at + 1 < len(tokens) and self.same_word(tokens[at], tokens[at + 1]):
                    at += 1
        if at is None or at >= stop:
            return None
        run = []
        for token in tokens[at + 1:at + 1 + FREE_TOKENS]:
            if token < 0:
                break
            run.append(token)
        if not run:
            return None
        chances = [RESUME_SHARE ** (i + 1) for i in range(len(run))]
        return Copy(run, chances, RESUMED_MATCH, anchor.source, (tokens, at, len(sequence)))

    def ends_answer(self, tokens: list[int]) -> bool:
        """Does this copy end with an end-of-sequence token (nothing can follow it)?"""
        return bool(tokens) and tokens[-1] in self.ends

    def propose(self, sequence: list[int], k: int) -> Proposal:
        found = self.copy(sequence, min(k, FREE_TOKENS) if k > 0 else FREE_TOKENS)
        return as_proposal(found) if found else Proposal()

    def verified(self, proposal: Proposal, accepted: int, seconds: Optional[float]) -> None:
        if not proposal.copied:
            return
        kept = min(accepted, proposal.copied)
        if kept == proposal.copied:
            self.factor = min(8.0, 2 * self.factor)
        elif 2 * kept < proposal.copied:
            self.factor = max(0.5, self.factor / 2)
        replay = self.replays.pop(tuple(proposal.tokens[:proposal.copied]), None)
        if replay is not None:
            self.verified_replay(replay, kept, accepted <= proposal.copied)
        if proposal.origin is None:
            return
        tokens, before, length = proposal.origin
        match = self.recent.get((id(tokens), before, length), 0)
        if match:
            record = self.records[match_class(match)]
            record[0], record[1] = RECORD_DECAY * record[0] + (kept > 0), RECORD_DECAY * record[1] + 1
        anchor = self.anchor
        self.resumed += match == RESUMED_MATCH
        if match == RESUMED_MATCH and kept and anchor is not None:
            self.learn_rename(anchor, tokens, before, length)
        if match == RESUMED_MATCH and not kept and anchor is not None:  # a resumed copy missed: one try less
            anchor.tries += 1
            if anchor.tries >= RESUME_TRIES:
                self.anchor = None
        elif kept or match >= LONG_MATCH:  # the copy stood where the target writes: its place is the anchor
            repeated = anchor.repeated if match == RESUMED_MATCH and anchor is not None else match + kept
            exact = accepted <= proposal.copied
            if repeated >= RESUME_FROM_MATCH:
                self.anchor = Anchor(tokens, before + 1 + kept, proposal.source, length + kept + 1, exact,
                                     repeated=repeated)
            # (a copy of text seen to repeat less leaves the anchor where it was: an edit often copies its new value
            # from elsewhere, a number from the user's message, and the text it edits goes on after it)

    def verified_replay(self, replay: "Replay", kept: int, exact: bool) -> None:
        """The target verified a copy that replayed renames and kept `kept` of its tokens: a rename it parted from
        inside its new spelling is forgotten; the place after the kept tokens is where a copy resumes."""
        self.renamed += 1
        for first, end, rename in replay.spans:
            if first <= kept < end and rename in self.renames:
                self.renames.remove(rename)
        after = replay.after[kept - 1] if kept else None
        repeated = replay.basis + kept
        if after is not None and after <= len(replay.source) and repeated >= RESUME_FROM_MATCH:
            self.anchor = Anchor(replay.source, after, "suffix", replay.length + kept + 1, exact, repeated=repeated)

    def learn_rename(self, anchor: Anchor, source: list[int], before: int, length: int) -> None:
        """A resumed copy the target kept: the source tokens from the parting to `before` were replaced by the
        tokens the target wrote from the parting to `length`. Where that was one word for another, remember it."""
        if self.respell is None or not anchor.exact or len(self.own.tokens) < length or anchor.length < 1:
            return
        spell = self.respell.bytes_of
        rename = renamed_word(spell([t for t in source[anchor.next:before + 1] if t >= 0]),
                              spell(self.own.tokens[anchor.length - 1:length]))
        if rename is not None:
            self.renames = [rename] + [r for r in self.renames if r.old != rename.old][:RENAMES - 1]

    def stats(self) -> dict:
        return {**({"resumed_copies": self.resumed} if self.resumed else {}),
                **({"renamed_copies": self.renamed} if self.renamed else {})}


def match_class(match: int) -> int:
    """The class of a match's length (see MATCH_CLASSES)."""
    return next((i for i, top in enumerate(MATCH_CLASSES) if match <= top), len(MATCH_CLASSES))


def as_proposal(found: Copy) -> Proposal:
    return Proposal(list(found.tokens), None, copied=len(found.tokens), source=found.source, origin=found.origin)
