"""mkdocs-gen-files script: the command reference pages, built from the command line itself
(stepml_evolve.evolve.cli.reference), each followed by its hand-written notes
(docs/commands/notes/<slug>.md) where there are some."""

from pathlib import Path

import mkdocs_gen_files

from stepml_evolve.evolve.cli.reference import command_pages, settings_page

NOTES = Path(__file__).parent / "commands" / "notes"

pages = command_pages()
index = [
    "# Commands",
    "",
    "Every command, generated from `evolve COMMAND --help`, with notes on how to use it; the settings",
    "behind the options of `evolve run` and the replaying commands are on [Settings](settings.md).",
    "",
]
for page in pages:
    notes = NOTES / f"{page.slug}.md"
    text = page.markdown
    if notes.is_file():
        text += "\n## Notes\n\n" + notes.read_text()
    with mkdocs_gen_files.open(f"commands/{page.slug}.md", "w") as f:
        f.write(text)
    depth = "  " * (len(page.path) - 1)
    index.append(f"{depth}- [`{page.name}`]({page.slug}.md)")
with mkdocs_gen_files.open("commands/index.md", "w") as f:
    f.write("\n".join(index) + "\n")
with mkdocs_gen_files.open("commands/settings.md", "w") as f:
    f.write(settings_page())
