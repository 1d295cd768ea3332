"""The compile probe's rules, pure: which units to compile, how to judge their objects, and the cross-check with the cmake -P plan."""
