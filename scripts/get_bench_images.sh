#!/usr/bin/env bash
# Fetch REAL photographs for the read benchmark (scripts/bench_read.py) from package registries only.
#
#   bash scripts/get_bench_images.sh [DEST]        # DEST defaults to .bench/photos (git-ignored)
#
# Sources (nothing is installed: packages are downloaded into a temp dir and unpacked there):
#   Debian  lomiri-wallpapers-16.04  photo-contest wallpapers, CC-BY-4.0 / CC-BY-SA-4.0 (per file)
#   Debian  lomiri-wallpapers-20.04  two photographs (Kleiber, Infinite-Sea), CC-BY-SA-4.0
#   Debian  mate-backgrounds         the nature/ photographs, GPL-2+
#   PyPI    scikit-image (wheel)     colour photos in skimage/data: astronaut, rocket,
#                                    hubble_deep_field (public domain: NASA, SpaceX), chelsea,
#                                    coffee (CC0), motorcycle_left (Middlebury 2014 stereo data set);
#                                    licences as stated in skimage/data/_fetchers.py (copied along)
# Only files that are photographs are kept (the packages also hold drawings and gradients, which
# decode faster and would flatter everyone). Each package's copyright file is copied next to its
# photos, and DEST/SOURCES.tsv lists package, version, file, size and licence for every photo.
#
# Needs: apt-get (with package lists: run 'apt-get update' once), dpkg-deb, pip, python3.
# Idempotent: an existing DEST/SOURCES.tsv with every listed file present means nothing to do.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${1:-$REPO/.bench/photos}"
SKIMAGE_PIN="${BENCH_SKIMAGE_VERSION:-0.26.0}"

log() { echo "get_bench_images: $*" >&2; }
die() { log "$*"; exit 1; }

# package -> photographs kept (paths inside the package)
declare -A DEB_FILES=(
  [lomiri-wallpapers-16.04]="
    usr/share/backgrounds/Bridge_by_Sander_Klootwijk.jpg
    usr/share/backgrounds/Dragonfly_by_Bolly.jpg
    usr/share/backgrounds/Picture_0B_by_freespace.jpg
    usr/share/backgrounds/Picture_1A_by_freespace.jpg
    usr/share/backgrounds/Wine_by_Jakkub_Mede.jpg
    usr/share/backgrounds/aitzgorri_by_Aitzol_Berasategi.jpg
    usr/share/backgrounds/free_by_Peter_Nerlich.jpg
    usr/share/backgrounds/friends_by_Aitzol_Berasategi.jpg
    usr/share/backgrounds/greentock_by_Peter_Nerlich.jpg
    usr/share/backgrounds/life_by_Aitzol_Berasategi.jpg
    usr/share/backgrounds/picosdeeuropa_by_Aitzol_Berasategi.jpg
    usr/share/backgrounds/seeding_by_Clements_Engelhardt.jpg
    usr/share/backgrounds/sunset_by_Aitzol_Berasategi.jpg"
  [lomiri-wallpapers-20.04]="
    usr/share/backgrounds/Kleiber_by_Lukas_Baubkus.jpg
    usr/share/backgrounds/Infinite-Sea_by_Aury88.jpg"
  [mate-backgrounds]="
    usr/share/backgrounds/mate/nature/Aqua.jpg
    usr/share/backgrounds/mate/nature/Blinds.jpg
    usr/share/backgrounds/mate/nature/Dune.jpg
    usr/share/backgrounds/mate/nature/FreshFlower.jpg
    usr/share/backgrounds/mate/nature/Garden.jpg
    usr/share/backgrounds/mate/nature/GreenMeadow.jpg
    usr/share/backgrounds/mate/nature/LadyBird.jpg
    usr/share/backgrounds/mate/nature/RainDrops.jpg
    usr/share/backgrounds/mate/nature/Storm.jpg
    usr/share/backgrounds/mate/nature/TwoWings.jpg
    usr/share/backgrounds/mate/nature/Wood.jpg
    usr/share/backgrounds/mate/nature/YellowFlower.jpg"
)
declare -A DEB_LICENCE=(
  [lomiri-wallpapers-16.04]="CC-BY-4.0 or CC-BY-SA-4.0 (per file, see copyright)"
  [lomiri-wallpapers-20.04]="CC-BY-SA-4.0 (see copyright)"
  [mate-backgrounds]="GPL-2+ (see copyright)"
)
SKIMAGE_FILES="astronaut.png chelsea.png coffee.png rocket.jpg hubble_deep_field.jpg motorcycle_left.png"
declare -A SK_LICENCE=(
  [astronaut.png]="public domain (NASA)" [rocket.jpg]="public domain (SpaceX)"
  [hubble_deep_field.jpg]="public domain (NASA)" [chelsea.png]="CC0 (Stefan van der Walt)"
  [coffee.png]="CC0 (Rachel Michetti)" [motorcycle_left.png]="Middlebury stereo data set (research use)"
)

manifest="$DEST/SOURCES.tsv"
if [[ -f "$manifest" ]]; then
  missing=0
  while IFS=$'\t' read -r _ _ _ rel _ _; do
    [[ "$rel" == "path" ]] && continue
    [[ -f "$DEST/$rel" ]] || missing=1
  done < "$manifest"
  if [[ $missing == 0 ]]; then
    log "$DEST already complete ($(($(wc -l < "$manifest") - 1)) photos); nothing to do"
    exit 0
  fi
fi

command -v apt-get >/dev/null || die "apt-get not found (Debian/Ubuntu needed for the wallpaper packages)"
command -v dpkg-deb >/dev/null || die "dpkg-deb not found"
PY="${PYTHON:-python3}"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
chmod 755 "$TMP"   # apt-get download drops privileges to _apt when it can write here
mkdir -p "$DEST"
printf 'registry\tpackage\tversion\tpath\tbytes\tlicence\n' > "$manifest.tmp"

# --- Debian packages -------------------------------------------------------------------------
for pkg in "${!DEB_FILES[@]}"; do
  log "apt-get download $pkg"
  (cd "$TMP" && apt-get download -q "$pkg" >/dev/null 2>"$TMP/apt.err") \
    || { cat "$TMP/apt.err" >&2; die "apt-get download $pkg failed (hint: run 'apt-get update' first)"; }
  deb="$(ls "$TMP/${pkg}"_*.deb | head -1)"
  version="$(dpkg-deb -f "$deb" Version)"
  mkdir -p "$TMP/x-$pkg"
  dpkg-deb -x "$deb" "$TMP/x-$pkg"
  mkdir -p "$DEST/debian/$pkg"
  cp "$TMP/x-$pkg/usr/share/doc/$pkg/copyright" "$DEST/debian/$pkg/copyright"
  for f in ${DEB_FILES[$pkg]}; do
    [[ -f "$TMP/x-$pkg/$f" ]] || die "$pkg $version no longer ships $f (update the list in $0)"
    name="$(basename "$f")"
    cp "$TMP/x-$pkg/$f" "$DEST/debian/$pkg/$name"
    printf 'debian\t%s\t%s\t%s\t%s\t%s\n' "$pkg" "$version" "debian/$pkg/$name" \
      "$(stat -c %s "$DEST/debian/$pkg/$name")" "${DEB_LICENCE[$pkg]}" >> "$manifest.tmp"
  done
  rm -rf "$TMP/x-$pkg" "$deb"
done

# --- PyPI: scikit-image wheel (data files only; nothing is installed) -------------------------
log "pip download scikit-image==$SKIMAGE_PIN (wheel, no deps)"
"$PY" -m pip download -q --no-deps --only-binary :all: -d "$TMP/whl" "scikit-image==$SKIMAGE_PIN" \
  >/dev/null 2>"$TMP/pip.err" || { cat "$TMP/pip.err" >&2; die "pip download scikit-image failed"; }
mkdir -p "$DEST/pypi/scikit-image"
SK_PIN="$SKIMAGE_PIN" SK_LIST="$SKIMAGE_FILES" SK_DEST="$DEST/pypi/scikit-image" "$PY" - "$TMP"/whl/scikit_image-*.whl <<'EOF'
import os, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
for name in os.environ["SK_LIST"].split():
    with open(os.path.join(os.environ["SK_DEST"], name), "wb") as fh:
        fh.write(z.read(f"skimage/data/{name}"))
for cand in ("skimage/data/_fetchers.py", "scikit_image-%s.dist-info/LICENSE.txt" % os.environ["SK_PIN"]):
    if cand in z.namelist():
        with open(os.path.join(os.environ["SK_DEST"], os.path.basename(cand)), "wb") as fh:
            fh.write(z.read(cand))
EOF
for name in $SKIMAGE_FILES; do
  printf 'pypi\tscikit-image\t%s\t%s\t%s\t%s\n' "$SKIMAGE_PIN" "pypi/scikit-image/$name" \
    "$(stat -c %s "$DEST/pypi/scikit-image/$name")" "${SK_LICENCE[$name]}" >> "$manifest.tmp"
done

mv "$manifest.tmp" "$manifest"
log "$(($(wc -l < "$manifest") - 1)) photographs in $DEST (list: $manifest)"
