// The anchor of benches/bootstrap_vs_adminclient.rs: Kafka's own Java AdminClient creating N topics in one
// createTopics call, on the same broker and in the same run as remote-wal's bootstrap.
//
//   java -cp 'target/kafka-libs/*:target/bench-java' CreateTopicsAnchor create BOOTSTRAP PREFIX N
//       creates PREFIX_0 .. PREFIX_{N-1} (1 partition, replication factor 1) in one createTopics call and prints
//       two figures in milliseconds from the call: until every topic's future completed (the controller
//       acknowledged the creation), then until describeTopics finds every topic (the broker lists them; polled
//       after 10 ms, doubling up to 1 s). The client is connected first, as the Rust side's admin is.
//   java -cp ... CreateTopicsAnchor delete BOOTSTRAP PREFIX...
//       deletes every topic whose name starts with one of PREFIX_, waits until the broker lists none of them, and
//       prints how many.

import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.Set;
import java.util.concurrent.ExecutionException;
import java.util.stream.Collectors;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;

public final class CreateTopicsAnchor {
    public static void main(String[] args) throws Exception {
        if (args.length < 3) {
            System.err.println("usage: CreateTopicsAnchor create BOOTSTRAP PREFIX N | delete BOOTSTRAP PREFIX...");
            System.exit(2);
        }
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, args[1]);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "120000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "300000");
        // Against a secure broker: the client properties of [wal.security] (security.protocol, ssl.*, sasl.*).
        String clientConfig = System.getenv("ANCHOR_CLIENT_CONFIG");
        if (clientConfig != null && !clientConfig.isEmpty()) {
            try (java.io.FileInputStream in = new java.io.FileInputStream(clientConfig)) {
                props.load(in);
            }
        }
        try (Admin admin = Admin.create(props)) {
            // Connect (and learn the cluster) before timing.
            admin.describeCluster().nodes().get();
            switch (args[0]) {
                case "create": {
                    String prefix = args[2];
                    int n = Integer.parseInt(args[3]);
                    List<NewTopic> topics = new ArrayList<>(n);
                    for (int i = 0; i < n; i++) {
                        topics.add(new NewTopic(prefix + "_" + i, 1, (short) 1));
                    }
                    List<String> names = topics.stream().map(NewTopic::name).collect(Collectors.toList());
                    long start = System.nanoTime();
                    admin.createTopics(topics).all().get();
                    long acked = System.nanoTime() - start;
                    long delayMs = 10;
                    while (true) {
                        try {
                            admin.describeTopics(names).allTopicNames().get();
                            break;
                        } catch (ExecutionException e) {
                            if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) {
                                throw e;
                            }
                        }
                        Thread.sleep(delayMs);
                        delayMs = Math.min(delayMs * 2, 1000);
                    }
                    long listed = System.nanoTime() - start;
                    System.out.println((acked / 1_000) / 1000.0 + " " + (listed / 1_000) / 1000.0);
                    break;
                }
                case "delete": {
                    Set<String> all = admin.listTopics().names().get();
                    List<String> prefixes = new ArrayList<>();
                    for (int i = 2; i < args.length; i++) {
                        prefixes.add(args[i] + "_");
                    }
                    Set<String> doomed = all.stream()
                            .filter(t -> prefixes.stream().anyMatch(t::startsWith))
                            .collect(Collectors.toSet());
                    // In requests of 500: one request deleting thousands of topics can fail on the broker.
                    List<String> pending = new ArrayList<>(doomed);
                    for (int from = 0; from < pending.size(); from += 500) {
                        List<String> chunk = pending.subList(from, Math.min(from + 500, pending.size()));
                        for (KafkaFuture<Void> deleted : admin.deleteTopics(chunk).topicNameValues().values()) {
                            try {
                                deleted.get();
                            } catch (ExecutionException e) {
                                // Listed while its deletion was under way: gone already.
                                if (!(e.getCause() instanceof UnknownTopicOrPartitionException)) {
                                    throw e;
                                }
                            }
                        }
                    }
                    // Until the broker no longer lists any of them: the next phase does not run behind this one.
                    long delayMs = 10;
                    while (true) {
                        Set<String> left = admin.listTopics().names().get();
                        if (left.stream().noneMatch(doomed::contains)) {
                            break;
                        }
                        Thread.sleep(delayMs);
                        delayMs = Math.min(delayMs * 2, 1000);
                    }
                    System.out.println(doomed.size());
                    break;
                }
                default:
                    System.err.println("unknown mode " + args[0]);
                    System.exit(2);
            }
        }
    }
}
