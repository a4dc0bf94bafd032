package esun.jmeter;

import com.thoughtworks.xstream.converters.Converter;
import com.thoughtworks.xstream.converters.MarshallingContext;
import com.thoughtworks.xstream.converters.UnmarshallingContext;
import com.thoughtworks.xstream.io.HierarchicalStreamReader;
import com.thoughtworks.xstream.io.HierarchicalStreamWriter;
import com.thoughtworks.xstream.mapper.Mapper;
import com.thoughtworks.xstream.mapper.SecurityMapper;
import com.thoughtworks.xstream.security.WildcardTypePermission;

/**
 * Let Debian's JMeter 2.13 read its own test plans again.
 *
 * <p>Debian pairs JMeter 2.13 with XStream 1.4.20, whose security framework (since 1.4.18) forbids every class not
 * allowed explicitly, so loading any .jmx fails with "ForbiddenClassException: org.apache.jmeter.save.ScriptWrapper"
 * (and jmeter still exits 0). JMeter 2.13 never allows its classes, but it builds every converter listed in
 * saveservice.properties with its XStream's mapper: registered there (see build.sh), this "converter" converts
 * nothing and, when built, allows JMeter's own packages on that mapper.
 */
public final class AllowJMeterTypes implements Converter {
    private static final String[] JMETER_PACKAGES = {"org.apache.jmeter.**", "org.apache.jorphan.**"};

    public AllowJMeterTypes(Mapper mapper) {
        SecurityMapper security = (SecurityMapper) mapper.lookupMapperOfType(SecurityMapper.class);
        if (security != null) {  // null: an XStream older than 1.4.7, which reads every class anyway
            security.addPermission(new WildcardTypePermission(JMETER_PACKAGES));
        }
    }

    @Override
    public boolean canConvert(Class type) {
        return false;
    }

    @Override
    public void marshal(Object source, HierarchicalStreamWriter writer, MarshallingContext context) {
        throw new UnsupportedOperationException("AllowJMeterTypes converts nothing");
    }

    @Override
    public Object unmarshal(HierarchicalStreamReader reader, UnmarshallingContext context) {
        throw new UnsupportedOperationException("AllowJMeterTypes converts nothing");
    }
}
