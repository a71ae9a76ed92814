/* An ELF file without probes, which a wildcard path matches along with the others. */
int main(void)
{
    return 0;
}
