#!/usr/bin/env bash
# Line, word and character counts plus the ten most frequent words of each file, as JSON.
set -euo pipefail

if [ "$#" -eq 0 ]; then
  echo "usage: $0 FILE [FILE ...]" >&2
  exit 2
fi

for file in "$@"; do
  if [ ! -f "$file" ]; then
    echo "$file: not a file" >&2
    continue
  fi
  if grep -qP '\x00' "$file" 2>/dev/null; then
    echo "$file: binary, skipped" >&2
    continue
  fi
  lines=$(wc -l < "$file")
  words=$(wc -w < "$file")
  chars=$(wc -m < "$file")
  top=$(tr -cs "[:alnum:]'" '\n' < "$file" | tr '[:upper:]' '[:lower:]' \
    | awk 'length($0) >= 3' | sort | uniq -c | sort -k1,1nr -k2 | head -n 10 | awk '{print $2}')
  jq -cn --arg file "$file" --argjson lines "$lines" --argjson words "$words" --argjson chars "$chars" \
    --arg top "$top" '{file: $file, lines: $lines, words: $words, chars: $chars,
      top_words: ($top | split("\n") | map(select(length > 0)))}'
done
