#!/usr/bin/env bash
# Fetch the site's third-party JavaScript from the npm registry (pinned), so the built book loads nothing
# from another host. Unpacks into _build/assets/vendor/, served as _static/vendor/: MathJax 3, require.js, the ipywidgets HTML
# manager, reveal.js (the slides). Called by `make book`; does nothing when the pinned versions are already there.
set -euo pipefail
cd "$(dirname "$0")/.."
PACKAGES=(mathjax@3.2.2 requirejs@2.3.7 @jupyter-widgets/html-manager@1.0.15 reveal.js@5.2.1)
dest=_build/assets/vendor
stamp="$dest/.versions"
LAYOUT="${PACKAGES[*]} (reveal.js: dist, math and notes plugins)"  # what the stamp records: a new layout fetches again
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$LAYOUT" ]; then exit 0; fi
command -v npm >/dev/null || { echo "npm is needed to fetch the site's JavaScript (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "${PACKAGES[@]}" >/dev/null)
rm -rf "$dest"; mkdir -p "$dest/mathjax" "$dest/html-manager"
tar xzf "$tmp"/mathjax-*.tgz -C "$tmp" package/es5 && cp -r "$tmp"/package/es5/. "$dest/mathjax/" && rm -rf "$tmp/package"
tar xzf "$tmp"/requirejs-*.tgz -C "$tmp" package/require.js && cp "$tmp/package/require.js" "$dest/" && rm -rf "$tmp/package"
tar xzf "$tmp"/jupyter-widgets-html-manager-*.tgz -C "$tmp" package/dist && cp -r "$tmp"/package/dist/. "$dest/html-manager/"
rm -f "$dest"/html-manager/*.map
rm -rf "$tmp/package"; mkdir -p "$dest/reveal.js/dist" "$dest/reveal.js/plugin"  # the slides (tools/slides.py): core, theme, math and notes
tar xzf "$tmp"/reveal.js-*.tgz -C "$tmp" package/dist package/plugin/math package/plugin/notes \
  && cp -r "$tmp"/package/dist/. "$dest/reveal.js/dist/" \
  && cp -r "$tmp"/package/plugin/math "$tmp"/package/plugin/notes "$dest/reveal.js/plugin/" \
  && rm -rf "$tmp/package" && rm -f "$dest"/reveal.js/dist/*.map "$dest"/reveal.js/dist/*.esm.js
echo "$LAYOUT" > "$stamp"
echo "fetched ${PACKAGES[*]} into $dest"
