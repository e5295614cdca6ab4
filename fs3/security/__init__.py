"""Who may do what: the cluster secret and the keys derived from it.

Every credential in fs3 (service and user tokens, chunk capabilities) is
derived from one cluster secret that ``fs3 cluster up`` creates beside the
cluster file. Deriving per-purpose keys (:func:`derive_key`) means a key
leaked for one purpose (say, capability signing on a storage node) cannot be
used to mint credentials of another kind.
"""
