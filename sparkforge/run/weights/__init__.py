"""Model weights on the nodes: the download plan and its containers, the scripts they run, and streaming one
node's copy to its peers."""
