#!/usr/bin/env bash
# Build what testing/jmeter/run.sh needs to load plans in Debian's JMeter 2.13 (see AllowJMeterTypes.java):
#   build/allow-jmeter-types.jar   the converter that allows JMeter's classes in XStream >= 1.4.18
#   build/saveservice.properties   JMeter's own, plus the line that registers that converter
# Idempotent: rebuilds only when the source or JMeter's saveservice.properties is newer than the output.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="$(cd "$here/.." && pwd)/build"
jmeter_home="${JMETER_HOME:-/usr/share/jmeter}"
xstream_jar="${XSTREAM_JAR:-/usr/share/java/xstream.jar}"
jar="$out/allow-jmeter-types.jar"
props="$out/saveservice.properties"

if [ -f "$jar" ] && [ "$jar" -nt "$here/AllowJMeterTypes.java" ] && [ -f "$props" ] \
        && [ "$props" -nt "$jmeter_home/bin/saveservice.properties" ]; then
    echo "jmeter xstream fix: up to date ($out)"
    exit 0
fi
mkdir -p "$out/classes"
javac -nowarn --release 11 -cp "$xstream_jar" -d "$out/classes" "$here/AllowJMeterTypes.java"
jar cf "$jar" -C "$out/classes" .
{
    cat "$jmeter_home/bin/saveservice.properties"
    echo
    echo "# Added by testing/jmeter/xstream/build.sh: allow JMeter's classes in XStream >= 1.4.18."
    echo "_esun.jmeter.AllowJMeterTypes=collection"
} > "$props"
echo "jmeter xstream fix: built $jar and $props"
