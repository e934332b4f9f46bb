/* pause: the infrastructure container of every pod in a local fastgshare cluster. It holds the
 * pod's namespaces open, reaps zombies (it is PID 1 of pods that share a PID namespace) and
 * exits on SIGTERM or SIGINT. Built statically by fastgshare_cluster/images.py. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int signum)
{
    (void)signum;
    _exit(0);
}

static void reap(int signum)
{
    (void)signum;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void)
{
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGTERM, &on_stop, NULL);
    sigaction(SIGINT, &on_stop, NULL);
    sigaction(SIGCHLD, &on_child, NULL);
    for (;;)
        pause();
}
