#!/usr/bin/env bash
# Run the judge plan headless with Debian's JMeter 2.13; extra arguments go to jmeter.
#
#   testing/jmeter/run.sh -l results.jtl -Jhost=127.0.0.1 -Jport=8080 -Jduration=60
#
# This is `jmeter -n -t testing/jmeter/judge.jmx "$@"` plus two properties without which Debian's JMeter 2.13
# cannot load any plan (XStream 1.4.20 forbids JMeter's classes; see xstream/AllowJMeterTypes.java). Build
# them first with testing/install_tools.sh. Results (-l) are CSV with a header line and each failure's
# message; read them with `.venv/bin/python -m testing.jtl RESULTS.jtl`. JMeter exits 0 even when the plan
# fails to load or samples fail: check the .jtl.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
jmeter_home="${JMETER_HOME:-/usr/share/jmeter}"
build="$here/build"
if ! command -v jmeter >/dev/null 2>&1; then
    echo "run.sh: jmeter is not installed: run testing/install_tools.sh" >&2
    exit 127
fi
if [ ! -f "$build/allow-jmeter-types.jar" ] || [ ! -f "$build/saveservice.properties" ]; then
    echo "run.sh: $build is missing the XStream fix: run testing/install_tools.sh" >&2
    exit 1
fi
# JMeter 2.13 reads saveservice_properties as a path under its home: reach ours from there.
props_from_home="/$(realpath --relative-to="$jmeter_home" "$build/saveservice.properties")"
exec jmeter -n -t "$here/judge.jmx" \
    -Jsaveservice_properties="$props_from_home" \
    -Juser.classpath="$build/allow-jmeter-types.jar" \
    -Jjmeter.save.saveservice.output_format=csv \
    -Jjmeter.save.saveservice.print_field_names=true \
    -Jjmeter.save.saveservice.assertion_results_failure_message=true \
    "$@"
