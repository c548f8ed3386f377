"""Installing a skill into a space's skill image. The entry is `start.do_start_install` (and
`do_start_uninstall`): it queues the admin job in `jobs`, which plans the generation (`plan`)
and builds it (`build`: the build sandbox and its `network`, the `steps` inside it with the
declared `dependencies` installed by `packages`, the snapshot, the record). The generations,
rollback and clean-up are `skills.images`; the pages `skills.image_views`.
"""
