"""Skills imported from a source that can move on: a git repository (`git`, pure: the URL's
rules and git as a subprocess), the writes and checks on it (`services`) and its pages
(`pages`). May import the rest of `skills` and `console`; nothing imports it but the URLs,
the tasks and the import command."""
