"""Graph capture: torch.compile over a run (`compiling`), decode steps captured once over a static cache
(`graph_decode`), and torchair's ACL-graph settings (`acl_graph`); below the run core, importing none of it."""
