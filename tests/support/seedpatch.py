"""The seeds' patch to SGLang's real `srt/models/deepseek_v2.py`, as edits a user makes by hand:
layer id -1 in the EAGLE-3 capture list means "capture the embedding output" (upstream leaves
-1 in the list, where no layer index ever matches it).  Each edit finds its place by text, so
the same edit can be made on any release whose lines it touches are there: on 0.5.21 it is what
the patch is cut from, on 0.5.23 what a rebase must come to."""

REL = "srt/models/deepseek_v2.py"

PACKER = "        aux_hidden_states = AuxHiddenStatePacker(len(self.layers_to_capture))\n"
CAPTURE = ("        # specops: provides embedding-capture (EAGLE-3 layer id -1: the embedding output)\n"
           "        embedding = getattr(self, \"capture_embedding\", False)\n"
           "        aux_hidden_states = AuxHiddenStatePacker(len(self.layers_to_capture) + int(embedding))\n"
           "        if embedding:\n"
           "            aux_hidden_states.append({captured})\n")
IDS = ("            # TODO (Qiaolin-Yu): check if other draft models need similar layer id\n"
       "            # adjustment\n")
IDS_PATCHED = ("            self.model.capture_embedding = -1 in layer_ids\n"
               "            layer_ids = [val for val in layer_ids if val != -1]\n") + IDS
# A line 0.5.23 rewrote (the decoder layer's keyword became capture_gathered): an edit to it
# cannot be carried over without a person.
PREPARE = "            captured_last_layer_outputs=captured_last_layer_outputs,\n"
PREPARE_PATCHED = ("            captured_last_layer_outputs="
                   "None if self.layer_id < 0 else captured_last_layer_outputs,\n")


def _once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, f"{old!r} stands {text.count(old)} times"
    return text.replace(old, new)


def capture(text: str, residual: bool = False) -> str:
    """The seeds' edit.  `residual`: the variant that captures `hidden_states + residual`, a name
    0.5.21 took out of DeepseekV2Model.forward: it compiles, and fails only when -1 is used."""
    captured = "hidden_states + residual" if residual else "hidden_states"
    text = _once(text, PACKER, CAPTURE.format(captured=captured))
    return _once(text, IDS, IDS_PATCHED)


def conflicting(text: str) -> str:
    """The seeds' edit, and one to a line 0.5.23 rewrote."""
    return _once(capture(text), PREPARE, PREPARE_PATCHED)


def resolve(upstream_023: str) -> str:
    """What a person makes of the conflict on 0.5.23: the edit carried onto its new keyword."""
    return capture(_once(upstream_023, "            capture_gathered=captured_last_layer_outputs,\n",
                         "            capture_gathered=None if self.layer_id < 0 else captured_last_layer_outputs,\n"))
