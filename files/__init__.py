"""Files the product writes: private to their owner (files.private), written atomically
(files.atomic), never into the project's source tree (files.source_tree). Imports nothing of ours."""
