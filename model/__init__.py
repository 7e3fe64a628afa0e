"""The executable spec: pure state machines, no I/O, no clock reads.

`leaseproof.model.delivery` is the delivery lease machine; its values live
in `binding`, its invariants in `invariants`.
"""
